"""What the gateway keeps for its clients between requests (stored responses today; batches, files and
conversations later), each object owned by the key that made it. See `stored.base`."""
