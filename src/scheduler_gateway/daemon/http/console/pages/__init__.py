"""The console's pages, one module per group; ``Console`` (``console/app.py``) installs their routes."""
