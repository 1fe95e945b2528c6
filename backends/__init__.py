"""In-tree backend plugins, installed as ``hal.backends``. Each subpackage is one device family and is
registered in the ``hal.backends`` entry-point namespace; none imports its SDK at module import."""
