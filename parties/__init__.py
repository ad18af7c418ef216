"""Party processes (active and passive) of the two-party vertical federated learning system."""
