"""The processes of a run and the work directory they share: liveness.py (heartbeats, lost
processes) and workdir_lock.py (which run holds the work directory)."""
