"""Host side of each kernel family: render the instantiation, compile, load, launch."""
