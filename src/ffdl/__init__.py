"""ffdl: the Fabric for Deep Learning."""
