"""Secure aggregation (Bonawitz et al., CCS 2017, with the sparse neighbour graph of SecAgg+, Bell et al.,
CCS 2020): the server learns the modular sum of the parties' integer vectors and nothing else.

The protocol is pure functions (:mod:`.group`, :mod:`.shamir`, :mod:`.keys`, :mod:`.graph`) and two small
state objects (:class:`.protocol.Party`, :class:`.protocol.Server`); a method wires them into its round
through ``engine.call`` (:mod:`silofl.fl.exchange.secure_round`). See docs/concepts/secure_aggregation.md.
"""

from silofl.secure.protocol import Party, SecAggRefused, SecAggSettings, Server

__all__ = ["Party", "SecAggRefused", "SecAggSettings", "Server"]
