"""Studies of many problems: batch files (`batch`), running them (`runner`), the resumable
result store (`store`) and model-shape advice (`shape`)."""
