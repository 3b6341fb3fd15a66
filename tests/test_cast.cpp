// placeholder: the cast tests are being written
