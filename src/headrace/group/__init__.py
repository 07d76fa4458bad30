"""Consumer groups: coordinator placement, the classic and KIP-848 protocols, offsets."""
