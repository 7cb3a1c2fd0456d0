"""The pure model: state machines and policies. Takes ``now`` and a policy as arguments; no clock, no IO."""
