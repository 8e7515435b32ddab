"""Scripts that run in the child processes of the collector, inside the environment of the code under review.
This directory goes on their sys.path (never imported through the gatekeeper package), so they import only the
standard library, pytest and coverage, and carry `gatekeeper_` names that cannot shadow the project's modules."""
