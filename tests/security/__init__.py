"""Security tier: tenancy rules and hostile input, against the real stack."""
