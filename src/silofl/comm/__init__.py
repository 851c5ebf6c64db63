"""Everything that crosses a site boundary: the wire format, the messages of the engine seam and their
framing, and the engines that drive sites (in-process, torch.distributed) with the launcher. No method
names live here."""
