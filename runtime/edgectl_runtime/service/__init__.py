"""The worker that runs inside the service: it serves a plan (``worker``), tells systemd how it
is doing (``notify``), returns freed memory when quiet (``idle_trim``) and reads back what the
engine really runs (``readback``)."""
