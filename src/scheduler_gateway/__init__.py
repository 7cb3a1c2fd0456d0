"""scheduler-gateway: task gateway and scheduler on NATS JetStream.

Layers import inward only: ``daemon`` -> ``actors`` -> ``wire``.
"""
