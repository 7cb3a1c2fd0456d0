"""How it runs: config, the composition root, and the adapters (store, NATS bus, HTTP sidecar, worker)."""
