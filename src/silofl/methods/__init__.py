from silofl.methods.base import Client, Protocol, RoundEvents, accuracy, client_seeds
from silofl.methods.proxyfl import ProxyFL, ProxyFLClient, dml_loss

__all__ = ["Client", "Protocol", "RoundEvents", "accuracy", "client_seeds", "ProxyFL", "ProxyFLClient", "dml_loss"]
