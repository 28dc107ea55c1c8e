"""Wire formats: tensor encodings, payload framing and digests."""
