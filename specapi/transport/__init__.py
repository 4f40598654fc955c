"""One role's HTTP calls: the endpoint, the transport, the SDK seam, the errors a failing call raises."""
