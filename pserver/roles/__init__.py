"""Role drivers: thin loops that move messages between the transport and the pure logic."""
