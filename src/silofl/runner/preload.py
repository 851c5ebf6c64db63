"""What a process of ``silofl launch`` imports, imported once by the launcher's fork server
(:mod:`silofl.core.forking`): the process's entry (:mod:`silofl.runner.entry`), the run loop,
torch.distributed's engine, Opacus' accountants and torch's dynamo (which torch.optim imports at the first
optimizer). Importing starts no thread and opens no connection."""

import opacus.accountants.analysis.rdp  # noqa: F401
import torch._dynamo  # noqa: F401
import torch.distributed  # noqa: F401

import silofl.comm.torchdist  # noqa: F401
import silofl.runner.entry  # noqa: F401
import silofl.runner.loop  # noqa: F401
