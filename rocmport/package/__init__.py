"""Package: ship the port: wheels and sdists of the ported trees (build) and a container recipe (docker)."""
