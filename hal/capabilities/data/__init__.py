"""Generated data of hal.capabilities (shipped as package data; see docs/capabilities.md)."""
