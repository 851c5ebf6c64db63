from silofl.methods.base import Client, Protocol, RoundEvents, accuracy, client_seeds
from silofl.methods.client import SiteClient, dml_loss
from silofl.methods.proxyfl import ProxyFL, ProxyFLClient

__all__ = ["Client", "Protocol", "RoundEvents", "SiteClient", "accuracy", "client_seeds", "ProxyFL",
           "ProxyFLClient", "dml_loss"]
