"""The mapping space: its declaration (`declaration`), its closed-form count (`count`) and
its enumeration as arrays (`enumerate`)."""
