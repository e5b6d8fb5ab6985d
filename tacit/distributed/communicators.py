"""Every communicator tacit ships, registered by importing this one module: code that reads the
registry (EngineArgs checking --communicator, a rank building its communicator) imports
COMMUNICATORS from here, so a new implementation is added in one place."""

from tacit.distributed.communicator import COMMUNICATORS
from tacit.distributed.shm_communicator import ShmCommunicator
from tacit.distributed.torch_communicator import TorchCommunicator

__all__ = ["COMMUNICATORS", "ShmCommunicator", "TorchCommunicator"]
