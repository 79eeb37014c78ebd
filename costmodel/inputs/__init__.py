"""What the user gives, read and checked: input files (load), Hugging Face configs (hf,
hf_schemas), the field types they share (fields), the physical bounds and warnings (limits,
advice), and units at the boundary (units)."""
