"""What a user asks of a workspace: status (derived from the records and the sources alone), audit,
reverify, repair and the doctor."""
