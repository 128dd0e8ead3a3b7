"""The SRE console: server-rendered pages over the triage use cases."""
