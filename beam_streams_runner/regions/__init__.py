"""Consistent regions: the controller, commit records and reset (design section 12)."""
