"""The built-in methods; importing this package registers them (:mod:`silofl.fl.registry`)."""

from silofl.fl.methods import avgpush, client_dp, cwt, fedavg, fml, local, proxyfl  # noqa: F401
from silofl.fl.methods import ditto, fedopt, fedprox, mrmtl  # noqa: F401

ORDER = ("proxyfl", "fedavg", "fml", "avgpush", "cwt", "regular", "joint", "dp-fedavg", "dp-fedadam", "dp-fednova",
         "dp2-rmsprop", "fedadam", "fednova", "rmsprop",
         "fedprox", "fedavg-adam", "fedavg-yogi", "ditto", "mr-mtl")
