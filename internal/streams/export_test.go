package streams

// PlacementPending exposes placementPending to the external tests.
var PlacementPending = placementPending
