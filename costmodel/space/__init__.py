"""The mapping space's dimensions and the rules of which values a model allows."""
