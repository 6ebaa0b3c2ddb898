"""Wire formats: the Liftbridge envelope, protobuf messages (pb), the replicate response."""
