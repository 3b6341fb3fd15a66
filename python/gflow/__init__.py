"""gflow: composable gradient-exchange policies for data-parallel training.

The PyTorch front end is gflow.torch (Horovod's shape: init(), DistributedOptimizer,
broadcast_parameters, ...). gflow.errors holds the typed errors every gflow call raises.
"""
from . import errors  # noqa: F401  (the C++ module raises these classes)

__version__ = "0.1.0"
