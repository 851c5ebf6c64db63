"""Federated methods as plug-ins: each is one module under :mod:`silofl.fl.methods` and one registration
(:mod:`silofl.fl.registry`); the exchanges they share (:mod:`silofl.fl.exchange`) hold both the sites'
steps and the coordinator's round. Nothing here knows which engine runs the sites."""

from silofl.fl.coordinator import Coordinator, Method, RoundEvents
from silofl.fl.registry import MethodInfo, method_info, methods, register

__all__ = ["Coordinator", "Method", "RoundEvents", "MethodInfo", "method_info", "methods", "register"]
