"""Under-stores behind one small async interface (see `base.Store`)."""
