-- TICKIT sample schema for a MariaDB source (scripts/tickit.py Placement), idempotent: the same tables and keys
-- as schemas/tickit.sql in MariaDB's types. A TICKIT system (ecomm, ems, crm) is a database of the server, as
-- a schema is in PostgreSQL; Debezium's MariaDB connector names its topics <prefix>.<database>.<table>.
-- boolean is MariaDB's tinyint(1) (0/1); timestamp is datetime(6), zone-less with microseconds like
-- PostgreSQL's timestamp. No REPLICA IDENTITY: the binlog (binlog_row_image=FULL) logs whole rows.

CREATE DATABASE IF NOT EXISTS ecomm;
CREATE DATABASE IF NOT EXISTS ems;
CREATE DATABASE IF NOT EXISTS crm;

CREATE TABLE IF NOT EXISTS crm.users (
  userid integer PRIMARY KEY, username char(8), firstname varchar(30), lastname varchar(30),
  city varchar(30), state char(2), email varchar(100), phone char(14), likesports boolean, liketheatre boolean,
  likeconcerts boolean, likejazz boolean, likeclassical boolean, likeopera boolean, likerock boolean,
  likevegas boolean, likebroadway boolean, likemusicals boolean);

CREATE TABLE IF NOT EXISTS ems.venue (
  venueid smallint PRIMARY KEY, venuename varchar(100), venuecity varchar(30),
  venuestate char(2), venueseats integer);

CREATE TABLE IF NOT EXISTS ems.category (
  catid smallint PRIMARY KEY, catgroup varchar(10), catname varchar(10), catdesc varchar(50));

CREATE TABLE IF NOT EXISTS ecomm.date (
  dateid smallint PRIMARY KEY, caldate date NOT NULL, day char(3) NOT NULL, week smallint NOT NULL,
  month char(5) NOT NULL, qtr char(5) NOT NULL, year smallint NOT NULL, holiday boolean DEFAULT false);

CREATE TABLE IF NOT EXISTS ems.event (
  eventid integer PRIMARY KEY, venueid smallint NOT NULL, catid smallint NOT NULL,
  dateid smallint NOT NULL, eventname varchar(200), starttime datetime(6));

CREATE TABLE IF NOT EXISTS ecomm.listing (
  listid integer PRIMARY KEY, sellerid integer NOT NULL, eventid integer NOT NULL,
  dateid smallint NOT NULL, numtickets smallint NOT NULL, priceperticket decimal(8,2), totalprice decimal(8,2),
  listtime datetime(6));

CREATE TABLE IF NOT EXISTS ecomm.sales (
  salesid integer PRIMARY KEY, listid integer NOT NULL, sellerid integer NOT NULL,
  buyerid integer NOT NULL, eventid integer NOT NULL, dateid smallint NOT NULL, qtysold smallint NOT NULL,
  pricepaid decimal(8,2), commission decimal(8,2), saletime datetime(6));
