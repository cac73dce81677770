"""What every kernel family shares: device facts, kernel loading, split scratch, TMA layouts."""
