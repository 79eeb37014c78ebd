"""What people read: tables and JSON (`tables`) and plots (`plots`)."""
