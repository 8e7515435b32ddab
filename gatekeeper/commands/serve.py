"""`gatekeeper serve`: run the GitHub App (webhooks, queue, workers) under uvicorn, or one part of it."""

from __future__ import annotations

import logging


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "serve", help="run the GitHub App server",
        description="Run the GitHub App. Settings come from --config (YAML) and the environment variables "
                    "GATEKEEPER_WEBHOOK_SECRET, GATEKEEPER_APP_ID, GATEKEEPER_PRIVATE_KEY_PATH, GATEKEEPER_DB "
                    "and GATEKEEPER_GITHUB_API_URL, which override the file.")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8080, help="port to listen on (default: 8080)")
    parser.add_argument("--config", metavar="FILE", help="YAML configuration file (see docs/github-app.md)")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    parser.add_argument("--role", choices=["all", "web", "workers"], default="all",
                        help="all: the web server and its worker process (default); web: only take webhooks in; "
                             "workers: only judge them (no HTTP). Web and worker processes share the queue "
                             "through the database: a postgresql:// GATEKEEPER_DB for several machines")
    parser.set_defaults(func=_run)


def _run(args) -> int:
    import uvicorn

    from gatekeeper.github.app import create_app
    from gatekeeper.github.config import load_config
    from gatekeeper.github.db import open_database

    config = load_config(args.config)  # InputError -> exit 2 with file and reason
    config.private_key()  # fail now, not at the first webhook, if the key cannot be read
    open_database(config.db_path, config.db_synchronous).close()  # and if the database cannot be opened
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.role == "workers":
        from gatekeeper.github.worker import run_workers

        run_workers(config)  # until SIGTERM or SIGINT
        return 0
    uvicorn.run(create_app(config, workers="none" if args.role == "web" else "process"), host=args.host,
                port=args.port, log_level=args.log_level, access_log=args.log_level == "debug")
    return 0
