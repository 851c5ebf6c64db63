"""What a site's process imports, imported once by ``deploy local``'s fork server
(:class:`silofl.deploy.procs.SiteProc`): the site's entry (:mod:`silofl.deploy.site_run`), its worker and warm
executor, the run loop a run's set-up step builds its site with, Opacus' accountants and torch's dynamo (which
torch.optim imports at the first optimizer), Flower's SuperNode (:class:`silofl.deploy.procs.ForkedNode`) —
and what the coordinator's ServerApp imports (:class:`silofl.deploy.procs.ForkedServerApp`: Flower's ServerApp
runtime, silofl's coordinator). Importing starts no thread and opens no connection, so forking after it is
safe (as torch's own DataLoader workers fork after importing torch)."""

import opacus.accountants.analysis.rdp  # noqa: F401
import torch._dynamo  # noqa: F401
from flwr.superlink.runtime import run_serverapp  # noqa: F401
from flwr.supernode import start_client_internal  # noqa: F401
from flwr.supernode.cli import flower_supernode  # noqa: F401

import silofl.deploy.coordinator  # noqa: F401
import silofl.deploy.executor  # noqa: F401
import silofl.deploy.flower_shim  # noqa: F401
import silofl.deploy.site  # noqa: F401
import silofl.deploy.site_run  # noqa: F401
import silofl.runner.loop  # noqa: F401
