"""The built-in methods; importing this package registers them (:mod:`silofl.fl.registry`)."""

from silofl.fl.methods import (  # noqa: F401
    avgpush,
    client_dp,
    cwt,
    ditto,
    fedavg,
    fedopt,
    fedper,
    fedprox,
    fml,
    local,
    mrmtl,
    proxyfl,
    scaffold,
)

ORDER = ("proxyfl", "fedavg", "fml", "avgpush", "cwt", "regular", "joint", "dp-fedavg", "dp-fedadam", "dp-fednova",
         "dp2-rmsprop", "fedadam", "fednova", "rmsprop",
         "fedprox", "fedavg-adam", "fedavg-yogi", "ditto", "mr-mtl", "fedper", "scaffold")
