"""Test doubles of the daemon's adapters: the in-memory store the actors' tests and the simulation run on."""
