"""The GitHub App: webhooks in, check runs out. How it fits together: docs/github-app.md."""
