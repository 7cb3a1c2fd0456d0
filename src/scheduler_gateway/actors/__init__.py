"""Who decides: the pure model next to the actors that own live state. Sees the outside only through ports."""
