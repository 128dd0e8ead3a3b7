"""Signalbox client: wait for an expected email as a contract."""
