DROP TABLE invoices;
DROP TABLE orders;
