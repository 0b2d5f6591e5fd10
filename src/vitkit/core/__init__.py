"""The core every layer may use: errors, strict parsing of plain data, progress reporting, the hardware."""
