"""Communication dimension: process groups, the Communicator seam and its implementations,
tensor-parallel layers and the worker processes that run them."""
