"""Model families: each module builds memra layer objects from a checkpoint and chains them."""
