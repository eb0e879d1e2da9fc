"""Geometry from the layers' constructor arguments (one definition for both layers)."""

from . import _kvlayer


def make_geometry(n_kv_heads, head_dim, max_ctx, window=None, *, head_dim_v=None,
                  storage="flat", max_append=1, rewind_slack=0):
    """A kvlayer.Geometry: flat storage (every logical row at its own physical row) unless
    storage="ring" (a compacting ring of window + max_append + rewind_slack + 31 rows, SPEC §6).
    Validated by the layer's constructor, which refuses an illegal one naming the field."""
    g = _kvlayer.Geometry()
    g.n_kv_heads = n_kv_heads
    g.head_dim_k = head_dim
    g.head_dim_v = head_dim if head_dim_v is None else head_dim_v
    g.max_ctx = max_ctx
    g.window = window
    g.storage = storage
    g.max_append = max_append
    g.rewind_slack = rewind_slack
    return g
