"""pytest plugin for Signalbox (filled in by the client work)."""
