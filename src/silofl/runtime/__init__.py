from silofl.runtime.transport import Envelope, InProcessTransport, Transport
from silofl.runtime.wire import decode, encode, validate

__all__ = ["Envelope", "InProcessTransport", "Transport", "decode", "encode", "validate"]
