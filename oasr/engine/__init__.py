"""Running models over many inputs: today a batched offline loop; the continuous-batching engine comes next."""
