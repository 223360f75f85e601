"""The Redis cache index: an accelerator, never the truth. One connection (connection.py) and one module per key
space, each saying who writes it and who reads it:

- `jev:{ns}:asset:{key}` (assets.py): the preencoder writes where an image asset is; workers read it (and drop an
  entry whose file is gone);
- `jev:{ns}:route:{route_key}` (routes.py): a worker writes the route keys of the states whose prefix its L3 holds;
  frontends read them to route a state where it is warm;
- `jev:{ns}:l2:{asset_key}` (l2.py): a worker writes the image assets its L2 held recently; frontends read them;
- `jev:worker:{id}` and `jev:workers` (workers.py): a worker announces itself; frontends discover workers.

`ns` is the checkpoint's namespace (`namespace(identity)`), so two checkpoints sharing one Redis never see each
other's entries; a frontend learns each worker's `ns` from its registration. Route and L2 entries are owner hashes
(owners.py): one field per worker holding the state or asset warm.
"""

from .connection import IndexConnection, IndexUnavailable, namespace

__all__ = ["IndexConnection", "IndexUnavailable", "namespace"]
