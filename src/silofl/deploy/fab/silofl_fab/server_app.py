"""The coordinator's ServerApp: runs silofl's coordinator over Flower (silofl.deploy.coordinator)."""

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run the deployment described by the coordinator folder named in the run config."""
    from silofl.deploy.coordinator import serve_run

    serve_run(grid, str(context.run_config["coordinator"]))
