"""Pulsar's own files and the official client's own test setup, run unchanged against compactmq."""
