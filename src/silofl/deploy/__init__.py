"""Deployment between institutions on Flower: sovereign site folders, keys and certificates, sealed
payloads, the Flower engine and app, and ``silofl deploy local`` (see the README's "Deploying between
institutions")."""
